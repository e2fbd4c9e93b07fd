"""Looking inside a running job: its control socket and what it answers
(stacks, usage, the start-up's progress), the merged stack tree, stalls."""
