"""`python -m controller`: green the process first (controller/manager.py says why), then start
the controller (controller/cli.py)."""
if __name__ == "__main__":
    from controller.manager import monkey_patch

    monkey_patch()
    from controller.cli import main

    main()
