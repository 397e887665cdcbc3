"""Keeping what is served in step with the engine directory and the configuration: watcher, repository, swapper, reload."""
