"""Where the jobs run: ``local`` (this process, the default) or ``ray`` (Ray Data actors, on a local or
an existing cluster; ``pip install 'detens[ray]'``). Importing detens never imports ray."""

ENGINES = ("local", "ray")

__all__ = ["ENGINES"]
