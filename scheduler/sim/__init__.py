"""heddle.scheduler.sim: the discrete-event rollout simulator (see docs/simulator.md)."""

__all__: list[str] = []
