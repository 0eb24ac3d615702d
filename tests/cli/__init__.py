"""Tests of the command line (hpcrl/cli): argument and override parsing, usage errors, what
validate/render/show/status/diff/completion print, printed commands, user defaults."""
