"""Running a job: its attempts and restarts, the supervisor (the policy), the
failures' order, and what the job reports."""
