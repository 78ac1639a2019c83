"""Phase 7 — horizontal fusion: sibling ops that read one input become one wide op. (Under construction.)

Run:  uv run python -m fusion.horizontal_fusion
"""


def run(quick: bool = False) -> None:
    print("Phase 7 is under construction.")


if __name__ == "__main__":
    run()
