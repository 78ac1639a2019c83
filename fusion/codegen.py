"""Phase 8 — code generation: every fusion region becomes one Triton kernel. (Under construction.)

Run:  uv run python -m fusion.codegen
"""


def run(quick: bool = False) -> None:
    print("Phase 8 is under construction.")


if __name__ == "__main__":
    run()
