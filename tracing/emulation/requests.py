"""The request bodies the emulator accepts (vLLM's field names; anything else is accepted and only
seeds the filler text), and the error answered to a request in the OpenAI format."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import JSONResponse

MAX_CHOICES = 128


class Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None


class Sampling(Body):
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: dict | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)

    @property
    def cap(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and (self.stream_options or {}).get("include_usage"))


class ChatBody(Sampling):
    messages: list[dict] = Field(min_length=1)


class CompletionBody(Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]


class EmbeddingBody(Body):
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


class RerankBody(Body):
    query: str
    documents: list[str | dict]
    top_n: int = Field(default=0, ge=0)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


class ScoreBody(Body):
    text_1: str | list[str] | None = None
    text_2: str | list[str] | None = None
    data_1: str | list[str] | None = None
    data_2: str | list[str] | None = None
    queries: str | list[str] | None = None
    documents: str | list[str] | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


class HttpError(Exception):
    """An error answered to the client in the OpenAI format."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}
        return JSONResponse(body, status_code=self.status)


def validation_message(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "body"
    return f"{where}: {first.get('msg', 'invalid value')}"
