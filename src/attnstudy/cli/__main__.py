"""``python -m attnstudy.cli``: the ``attnstudy`` command."""

from attnstudy.cli.main import entry

entry()
