"""Does a hint move the policy? The sampled hinted - plain gap (`hint_gap`) and the teacher-forced likelihood under a hint (`hint_use`)."""
