"""Cold placements: worker processes and everything that crosses into them.

Daemon side: pool (the workers of all cold versions), process (one child as the
daemon holds it), proxy (a cold version's placement). Worker side: child (the
worker's main). Both sides: wire (the messages), lane (the fast socketpair),
slots (shared-memory slots), slotoutputs (outputs computed into a slot).
"""
