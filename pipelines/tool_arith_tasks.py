"""`python -m pipelines.tool_arith_tasks`: the entry point; the code lives in
`pipelines.reference.tool_arith_tasks`."""

from pipelines.reference.tool_arith_tasks import main

if __name__ == "__main__":
    main()
