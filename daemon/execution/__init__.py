"""Running an admitted request: the layer both placements and the frontend build on.

`job` (the request in flight), `placement` (the contract of where a version
runs), `scheduler` (the hot placement: contexts on executor threads),
`executor`, `fairqueue`, `batcher`, `batchcap`, `inline` (when the frontend
computes a request itself), `outputs` (outputs computed into memory given
beforehand), `hashring`, `stats` (lock-free statistics). It imports nothing
above it: the frontend, the worker pool and the registry hand it their
callbacks (`ReplyFn`, `LateFn`, `InlineGate`, `HoldFn`).
"""
