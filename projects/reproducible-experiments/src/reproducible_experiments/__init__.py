"""MLflow experiment provenance that survives failure, on a JAX digits classifier.

Modules: `config`, `data`, `model`, `train`, `checkpoint` (the workload);
`identity`, `tracking`, `record`, `inventory`, `comparison`, `reproduce`
(the record around it); `plots`, `bench`, `cli`.
"""
