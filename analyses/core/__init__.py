"""What every analysis family shares: Task and its builders, task files, metrics, Result, the
config base class and the registry of analyses."""
