"""Where experiences go, exactly once per step: Parquet, SQL, the Ray queue, and the committed-step reader."""
