"""The agent: one host's part of a job for a launcher on another machine,
started by a starter, speaking over :mod:`mslaunch.wire`."""
