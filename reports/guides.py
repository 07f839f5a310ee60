"""One paragraph per analysis on how to read its section of the report."""

GUIDES = {
    "heads": (
        "Which attention heads matter. Importance is Michel et al.'s |dL/d gate| (all heads in one "
        "backward pass) next to the metric drop when a head alone is ablated. The pruning curve removes "
        "the least important heads 10% at a time: a flat start then a cliff means many heads are "
        "redundant; compare the orderings with the random band. Role scores label positional, "
        "previous-token, induction and sink heads."
    ),
    "attribution": (
        "Does attention explain the prediction? For each example, token importance by attention, "
        "rollout, gradients, integrated gradients and leave-one-out, and Kendall's tau between "
        "attention and each other method (Jain & Wallace 2019). Weak tau and small output changes "
        "under permuted attention mean attention weights are a poor stand-in for importance; so does "
        "adversarial attention with a JSD near ln 2 (the maximum) that leaves the output unchanged."
    ),
    "position": (
        "Lost in the middle: answer quality against the position of the relevant item in the context "
        "(Liu et al. 2023), with bootstrap intervals. A U-shape means the middle is neglected. The "
        "attention maps show which heads look at the gold item, and the sink panel shows how much "
        "attention parks on the first tokens against the uniform baseline."
    ),
    "patching": (
        "Where the computation happens. Each cell replaces one activation of the corrupted run by the "
        "clean run's (denoising) and shows how much of the clean behaviour returns (normalised logit "
        "difference: 1 = fully restored). Causal tracing restores states after noising the subject; "
        "attribution patching approximates every cell from one backward pass (its agreement with exact "
        "patching is reported)."
    ),
    "mlp": (
        "MLP layers as key-value memories (Geva et al. 2021): for each neuron, the prompts that "
        "trigger it most and the tokens its value vector promotes. Agreement is the fraction of "
        "neurons whose promoted token matches what follows their triggers; it tends to rise in "
        "upper layers."
    ),
    "kv": (
        "The KV cache: bytes per token and at full context, what grouped-query attention saves, the "
        "key and value norms by position (sink keys stand out at the start), and how the metric holds "
        "up when the cache keeps only sinks plus a recent window, a window alone, or heavy hitters."
    ),
    "probes": (
        "Linear probes per layer: how well a property can be read linearly from the activations, "
        "and selectivity (accuracy minus a control task with random labels per type, Hewitt & Liang "
        "2019). High accuracy with low selectivity means the probe memorises rather than reads."
    ),
    "circuits": (
        "Where the answer is written. The logit lens reads each block's input through the model's own "
        "final norm and unembedding: the answer's log-probability by layer and position, and the first "
        "layer where the answer is top-1. Direct logit attribution splits the final logit difference into "
        "embeddings, heads, MLPs and bias terms, with the final norm frozen at its actual scale, so the "
        "parts add up exactly."
    ),
}
