"""`python -m loadtest.peers`: our daemon and Centrifugo under the same load (loadtest/peers/scenario.py)."""

import typer

from loadtest.peers.scenario import main

if __name__ == "__main__":
    typer.run(main)
