"""`python -m pipelines.arith_tasks`: the entry point; the code lives in `pipelines.reference.arith_tasks`."""

from pipelines.reference.arith_tasks import main

if __name__ == "__main__":
    main()
