"""``python -m toolq.cli``: the same command line as the ``toolq`` script."""

from toolq.cli import main

if __name__ == "__main__":
    main(prog_name="toolq")
