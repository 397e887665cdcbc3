"""Client library for the inference socket (Client, Pipeline), camera frames and streams (Frame, Stream)
and shared memory (SharedMemory)."""

from infermux.client.inference import (AdminClient, AdminError, Client, EndpointsDown, InferError, Pipeline,
                                       Reply, RequestTooLarge)
from infermux.client.shared_memory import SharedMemory, local_view, regions_path
from infermux.client.stream import Stream, StreamCounts
from infermux.protocol import Frame, SharedTensor

__all__ = ["AdminClient", "AdminError", "Client", "EndpointsDown", "Frame", "InferError", "Pipeline", "Reply",
           "RequestTooLarge", "SharedMemory", "SharedTensor", "Stream", "StreamCounts", "local_view", "regions_path"]
