"""Params of `bertpipe models serve`: where it listens, how it batches, how much it queues, how it follows aliases."""

from pydantic import BaseModel, ConfigDict, Field


class ServeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"  # loopback unless told otherwise: a model service is not public by accident
    port: int = Field(8080, ge=1024, le=65535)
    alias: str = Field("champion", min_length=1)  # served when the model is named without @alias or /version
    backend: str = Field("torch", pattern=r"^(torch|onnx|int8)$")
    # auto: the GPU when torch sees one, else the CPU; cuda without a GPU is an error at start, not a silent CPU
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda)$")
    # Dynamic batching: concurrent requests are grouped up to this many, or for at most this long.
    max_batch_size: int = Field(32, ge=1, le=1024)
    batch_wait_ms: float = Field(10.0, ge=0.0, le=10_000.0)
    # Requests admitted at once (queued + in the model); beyond it the service answers 503 with Retry-After.
    max_queue: int = Field(256, ge=1, le=100_000)
    retry_after_s: int = Field(1, ge=1, le=3600)
    max_text_chars: int = Field(20_000, ge=1)  # longer texts are refused (413); long-but-allowed ones are windowed
    max_items: int = Field(256, ge=1, le=100_000)  # texts in one request ({"text": [...]}); more -> 413
    max_body_bytes: int = Field(1_000_000, ge=64)
    # The whole body must arrive within this; a slow sender gets 408 and never counts against max_queue.
    body_timeout_s: float = Field(10.0, gt=0.0, le=3600.0)
    # The request line and headers must arrive within this of the connection opening (or of the previous response
    # ending): a silent or trickling connection gets 408 and is closed instead of holding a socket for ever.
    head_timeout_s: float = Field(10.0, gt=0.0, le=3600.0)
    keep_alive_s: int = Field(5, ge=1, le=3600)  # an idle kept-alive connection is closed after this
    poll_s: float = Field(5.0, gt=0.0, le=3600.0)  # how often the registry alias is checked for a new version
    request_timeout_s: float = Field(60.0, gt=0.0)
    # torch intra-op threads of the inference worker; 0 = torch's default (all cores). On a machine shared with other
    # work, fewer threads than cores avoids the spin-waiting that made a 16 ms batch take 370 ms under load.
    num_threads: int = Field(0, ge=0, le=1024)
    graceful_timeout_s: float = Field(30.0, gt=0.0)  # on SIGTERM/SIGINT: time given to in-flight requests

    def accelerator(self) -> str:
        """LitServe's accelerator for ``device`` (checked: ``cuda`` without a GPU raises a one-line error)."""
        from bertpipe.lib.inference.predictor import resolve_device

        return resolve_device(self.device)
