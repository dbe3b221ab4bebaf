"""`python -m loadtest.report`: report.md, the plots and docs/benchmarks.md's tables from a
result that exists (loadtest/report/write.py); runs no benchmark."""

import typer

from loadtest.report.write import main

if __name__ == "__main__":
    typer.run(main)
