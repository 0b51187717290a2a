"""CUDA tensors: what gcomp.torch does with them (_Cuda, one instance, `cuda`), one job's device
side (_OnDevice), and the arrays the module gets. Every user looks `cuda` up here at call time
(_cuda.cuda), so that tests/python/test_torch_device.py's stand-in, set as _cuda.cuda, is the
one used everywhere."""

import torch

import gcomp


class _Cuda:
    """What this module does with CUDA tensors, in one place. The work on a device's tensors
    runs on a side stream of this module's (one per device), after an event recorded where the
    tensors were made ready (the caller's current stream: no device-wide sync); the tensors are
    kept for the caching allocator until that stream is done with them; a job's future is a
    CUDA-aware torch future completed on the side stream, so whoever waits on it waits for the
    result on the device. tests/python/test_torch_device.py swaps in a stand-in that runs this
    path on CPU tensors with the stand-in build of gcomp, and logs what it is asked to do."""

    def __init__(self):
        self._side = {}

    def on_device(self, t):
        return t.is_cuda

    def device(self, t):
        return t.device.index if t.device.index is not None else torch.cuda.current_device()

    def current_stream(self, device):
        return torch.cuda.current_stream(device)

    def side_stream(self, device):
        stream = self._side.get(device)
        if stream is None:
            stream = self._side[device] = torch.cuda.Stream(device)
        return stream

    def handle(self, stream):
        return stream.cuda_stream

    def ready_event(self, stream):
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait(self, stream, event):
        stream.wait_event(event)

    def keep_for(self, tensors, stream):
        for t in tensors:
            t.record_stream(stream)

    def using(self, stream):
        return torch.cuda.stream(stream)

    def future(self, device):
        return torch.futures.Future(devices=[torch.device("cuda", device)])

    def array(self, t):
        return t  # the module takes CUDA tensors in place (DLPack)

    def residual(self, ef):
        return torch.from_dlpack(ef.residual)


cuda = _Cuda()


def _residual_of(ef):
    """An ErrorFeedback's residual as a float32 torch tensor over its memory (no copy)."""
    return cuda.residual(ef) if ef.device != "cpu" else torch.from_numpy(ef.residual)


def _new_feedback(n, like):
    """An ErrorFeedback of n zeros where the tensor `like` is (host, or its CUDA device)."""
    if cuda.on_device(like):
        return gcomp.ErrorFeedback(n, device=cuda.device(like))
    return gcomp.ErrorFeedback(n)


class _OnDevice:
    """The device side of one job on CUDA tensors (None for CPU tensors): the side stream it
    runs on, the event it waits for, what it hands the module."""

    __slots__ = ("device", "stream", "ready", "stream_handle")

    def __init__(self, tensor, keep):
        self.device = cuda.device(tensor)
        self.stream = cuda.side_stream(self.device)
        self.ready = cuda.ready_event(cuda.current_stream(self.device))
        self.stream_handle = cuda.handle(self.stream)
        cuda.keep_for(keep, self.stream)

    def start(self):
        """In the job, first: the side stream waits for the tensors to be ready."""
        cuda.wait(self.stream, self.ready)

    @staticmethod
    def of(tensor, keep):
        return _OnDevice(tensor, keep) if cuda.on_device(tensor) else None

    @staticmethod
    def stream_of(on):
        """The stream= the module's calls get: the side stream's handle, or None (host)."""
        return on.stream_handle if on is not None else None


def _arrays(on, tensors):
    """What the module gets for these tensors: themselves, or on a device what `cuda` gives."""
    if on is None or tensors is None:
        return tensors
    if isinstance(tensors, list):
        return [cuda.array(t) for t in tensors]
    return cuda.array(tensors)
