#!/usr/bin/env bash
# Refreshes console/vendor/ from npm: the exact versions console/package-lock.json pins.
# quotad compiles console/ into its binary as it is, so neither building nor testing quotad
# runs npm; run this only to upgrade a vendored library (edit console/package.json first).
set -euo pipefail
cd "$(dirname "$0")/../console"
npm install --no-audit --no-fund --ignore-scripts
cp node_modules/uplot/dist/uPlot.iife.min.js vendor/
cp node_modules/uplot/dist/uPlot.min.css vendor/
cp node_modules/uplot/LICENSE vendor/uPlot.LICENSE
# axe-core: only the console's accessibility test reads it (tests/api/console_a11y.rs); quotad
# does not serve it.
cp node_modules/axe-core/axe.min.js vendor/
cp node_modules/axe-core/LICENSE vendor/axe-core.LICENSE
version=$(node -p 'require("./node_modules/uplot/package.json").version')
axe=$(node -p 'require("./node_modules/axe-core/package.json").version')
{
  echo "uPlot $version (MIT, https://github.com/leeoniya/uPlot)"
  echo "axe-core $axe (MPL-2.0, https://github.com/dequelabs/axe-core): for tests only, not served"
} > vendor/README
echo "vendored uPlot $version and axe-core $axe into console/vendor"
rm -rf node_modules
