"""The console's views: one module per view, each fed whole snapshots."""
