//! The engine: one place that composes scripts, environments and sandboxes into executions.
