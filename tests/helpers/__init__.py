"""What the test files share, a subpackage for each job. tests/ is on sys.path (pytest puts the
folder of the rootdir conftest there), so the tests import them as `helpers.<job>`."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
