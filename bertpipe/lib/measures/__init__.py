"""What the stages measure with: task metrics, the paired bootstrap, the task baselines, the fair masked-LM encoder
comparison with its window store, and the encoder gate score. Evaluate reports with them; finetune, distill and
export score with the metrics; register gates with the bootstrap and the encoder gate."""
