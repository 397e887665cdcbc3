"""What the daemon holds: the registry of models and versions, promotion and demotion, the memory budget."""
