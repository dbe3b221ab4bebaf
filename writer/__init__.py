"""The writer: the group commit into MySQL then Mongo (``message_writer``, its pure
decisions in ``core``), the host's writer process (``server``) and the API processes' link to it
(``client``) (README, "How delivery stays exact")."""
