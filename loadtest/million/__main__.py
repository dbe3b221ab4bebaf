"""`python -m loadtest.million`: a million WebSocket connections held (loadtest/million/scenario.py)."""

import random

from loadtest.million.scenario import app

if __name__ == "__main__":
    random.seed(1)
    app()
