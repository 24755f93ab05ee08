"""`python -m pipelines.countdown_tasks`: entry point; the code is `pipelines.reference.countdown_tasks`."""

from pipelines.reference.countdown_tasks import main

if __name__ == "__main__":
    main()
