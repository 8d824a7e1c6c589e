"""Workflow programs: the schema of `program:` in an instance's workflow (the control flow `scepsy
simulate` runs; models/simulation/programs.py executes it). The programs and their parameters are
described there."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# Largest values accepted: a simulated request this large never ends.
MAX_FANOUT = 1024  # beams, beam width, passages
MAX_TOKENS = 10_000_000
MAX_ITERATIONS = 100_000


class BeamSearchProgram(_Spec):
    kind: Literal["beam_search"]
    generator: str
    verifier: str
    beams: int = Field(default=4, ge=1, le=MAX_FANOUT, description="n: beams kept per iteration")
    beam_width: int = Field(default=4, ge=1, le=MAX_FANOUT, description="M: each survivor forks into M beams")
    max_iterations: int = Field(default=40, ge=1, le=MAX_ITERATIONS)
    question_tokens: int = Field(default=200, ge=1, le=MAX_TOKENS, description="system prompt + problem")
    step_tokens: float = Field(default=100.0, gt=0, le=MAX_TOKENS, description="mean tokens of one reasoning step")
    final_tokens: float = Field(default=200.0, gt=0, le=MAX_TOKENS, description="mean tokens generated in the last iteration")
    finish_probability: float = Field(default=0.2, ge=0, le=1, description="a step ends the solution")
    duplicate_probability: float = Field(default=0.0, ge=0, le=1, description="a step repeats a sibling's")
    verify_unique: bool = Field(default=True, description="score identical beams once")
    score_tokens: int = Field(default=1, ge=1, le=MAX_TOKENS, description="tokens the verifier returns")
    length_cv: float = Field(default=0.5, ge=0, le=100)


class RagProgram(_Spec):
    kind: Literal["rag"]
    embedder: str
    reranker: str | None = None
    generator: str
    query_tokens: int = Field(default=32, ge=1, le=MAX_TOKENS)
    passages: int = Field(default=10, ge=1, le=MAX_FANOUT, description="k: passages retrieved and reranked")
    passage_tokens: int = Field(default=128, ge=1, le=MAX_TOKENS)
    context_passages: int = Field(default=3, ge=1, le=MAX_FANOUT, description="top passages in the generator prompt")
    system_tokens: int = Field(default=64, ge=0, le=MAX_TOKENS)
    output_tokens: float = Field(default=96.0, gt=0, le=MAX_TOKENS, description="mean answer tokens")
    retrieve_s: float = Field(default=0.005, ge=0, le=3600)
    rerank_batched: bool = Field(default=True, description="one reranker call for all k pairs")
    length_cv: float = Field(default=0.5, ge=0, le=100)

    @field_validator("context_passages")
    @classmethod
    def _within_passages(cls, value: int, info: ValidationInfo) -> int:
        passages = info.data.get("passages")
        if passages is not None and value > passages:
            raise ValueError(f"context_passages {value} is more than the {passages} passages retrieved")
        return value


class EnsembleProgram(_Spec):
    kind: Literal["ensemble"]
    judges: list[str] = Field(min_length=2, description="LLMs that answer the question side by side")
    aggregator: str
    question_tokens: int = Field(default=300, ge=1)
    answer_tokens: float = Field(default=150.0, gt=0, description="mean tokens of one judge's answer")
    verdict_tokens: float = Field(default=60.0, gt=0, description="mean tokens of the aggregator's verdict")
    length_cv: float = Field(default=0.5, ge=0)


class StageCallSpec(_Spec):
    llm: str
    prompt_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    completion_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)


class StagesProgram(_Spec):
    kind: Literal["stages"]
    calls: list[StageCallSpec] = Field(default_factory=list, description="call lengths per stage llm")
    length_cv: float = Field(default=0.0, ge=0, le=100)


ProgramSpec = Annotated[Union[BeamSearchProgram, RagProgram, EnsembleProgram, StagesProgram], Field(discriminator="kind")]
Program = Union[BeamSearchProgram, RagProgram, EnsembleProgram, StagesProgram]


def program_llms(program: Program) -> dict[str, str]:
    """role -> llm name of every LLM the program calls (for validation against the stages)."""
    if isinstance(program, BeamSearchProgram):
        return {"generator": program.generator, "verifier": program.verifier}
    if isinstance(program, RagProgram):
        roles = {"embedder": program.embedder, "generator": program.generator}
        if program.reranker is not None:
            roles["reranker"] = program.reranker
        return roles
    if isinstance(program, EnsembleProgram):
        return {**{f"judges[{i}]": name for i, name in enumerate(program.judges)}, "aggregator": program.aggregator}
    return {f"calls[{i}].llm": c.llm for i, c in enumerate(program.calls)}


def continues_prompts(program: Program | None) -> bool:
    """Whether the workflow's calls may continue an earlier call's prompt and output, so that an
    engine serves them fast only while that prefix stays in its cache: beam search's chains, and a
    workflow with no program (its traced calls say nothing of their prompts)."""
    return program is None or isinstance(program, BeamSearchProgram)


def default_program() -> StagesProgram:
    return StagesProgram(kind="stages")
