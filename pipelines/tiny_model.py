"""`python -m pipelines.tiny_model`: the entry point; the code lives in `pipelines.reference.tiny_model`."""

from pipelines.reference.tiny_model import main

if __name__ == "__main__":
    main()
