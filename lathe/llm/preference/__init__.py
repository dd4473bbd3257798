"""Preference training (stages rm, dpo, kto): the losses, the reference model and the trainers."""
