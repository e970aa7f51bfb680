//! Python environments for snakebox: which interpreters exist, and uv-built virtual environments
//! kept in a cache keyed by content.
//!
//! An environment is built once per (interpreter, requirement set), in a temporary directory,
//! then renamed into place and never modified again: every later run reuses it read-only. The
//! install step runs uv through [`snakebox_sandbox`] with network access and write access to the
//! target and uv's cache only; the run step (the engine's business) never sees uv's cache.
//! Nothing here knows about MCP.
