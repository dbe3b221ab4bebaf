"""The host's writer process and the API processes' link to it (README, "How delivery stays exact")."""
