"""mlp-classifier: a small NNX multilayer perceptron on scikit-learn's digits.

The exemplar project of the repository: `config.py`, `data.py`, `model.py`,
`train.py`, `checkpoint.py` and `cli.py` have the same roles in every project.
"""

__version__ = "0.1.0"
