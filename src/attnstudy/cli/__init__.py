"""The ``attnstudy`` command: its verbs (:mod:`attnstudy.cli.main`), its arguments and the
generated command reference."""
