"""Client library for the inference socket (Client, Pipeline) and shared memory (SharedMemory)."""

from infermux.client.inference import (AdminClient, AdminError, Client, EndpointsDown, InferError, Pipeline,
                                       Reply, RequestTooLarge)
from infermux.client.shared_memory import SharedMemory, local_view, regions_path
from infermux.protocol import SharedTensor

__all__ = ["AdminClient", "AdminError", "Client", "EndpointsDown", "InferError", "Pipeline", "Reply",
           "RequestTooLarge", "SharedMemory", "SharedTensor", "local_view", "regions_path"]
