"""heddle.operator: the kopf operator, the rollout session and the ``heddle`` CLI.

Importing this package stays cheap (no kopf, no kubernetes): the CLI entry
point lives here and must start fast for ``heddle bench`` and ``heddle version``.
"""

__all__: list[str] = []
