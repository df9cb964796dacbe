"""``python -m toolq.edges.cli``: the same command line as the ``toolq`` script."""

from toolq.edges.cli import main

if __name__ == "__main__":
    main(prog_name="toolq")
