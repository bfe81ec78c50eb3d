"""`python -m experiments.learning_study`: runs the study's arms and seeds, then writes its report."""

from experiments.learning_study import main

main()
