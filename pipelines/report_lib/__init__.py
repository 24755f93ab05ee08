"""Read a finished (or running) run directory and draw it: the one library behind `notebooks/` and
`python -m pipelines.report`, so each plot has exactly one implementation.

- `runs`: what a run dir is (explore or bench), its MLflow run id, its stores found relative to the dir;
- `experiences`: the committed, eval and SQL experiences as pyarrow tables;
- `mlflow_store`: metric histories, artifacts and the report's upload, through `mlflow.MlflowClient`;
- `summaries`: per-step statistics and rollout rows, pure functions of `pa.Table`s;
- `plots`: one function per figure (matplotlib, Agg, no pyplot);
- `html`: the rollout browser, tables and the report page;
- `page`: the report itself, `RUN_DIR/report/index.html` with its PNGs.
"""
