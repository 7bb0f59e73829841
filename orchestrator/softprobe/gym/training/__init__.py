"""Training on top of episodes: sessions with per-step rewards, Promptfoo export, train/eval
splits and the Gymnasium adapter."""
