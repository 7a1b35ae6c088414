"""`python -m sglang_ssd.planner`: the planner's command line (planner/choose.py)."""

from sglang_ssd.planner.choose import main

if __name__ == "__main__":
    main()
