"""The learning studies (is SPADE learning, and from what?): each study a subpackage with its command and a README of its current results; `bench/` holds the speed benchmarks."""
