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
version=$(node -p 'require("./node_modules/uplot/package.json").version')
echo "uPlot $version (MIT, https://github.com/leeoniya/uPlot)" > vendor/README
echo "vendored uPlot $version into console/vendor"
rm -rf node_modules
