"""scepsy: GPU capacity planning for multi-LLM agentic workflows."""

__version__ = "0.1.0"
