"""The controller: keeps the plan right while load drifts (docs/control.md)."""
