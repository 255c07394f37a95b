#!/usr/bin/env node
// hclfmt: HCL's canonical layout (hclwrite.Format, the formatter `terraform fmt` is built on),
// from @cdktn/hcl-tools, which ships it compiled to WebAssembly. It stands in for
// `terraform fmt -check`, whose binary no package registry ships.
//
//   hclfmt -check FILE...   print each file whose layout differs; exit 3 if any does
//   hclfmt FILE             print the file as formatted
//   hclfmt -version         print the formatter package and its version
"use strict";

const fs = require("fs");
const path = require("path");

const PACKAGE = "@cdktn/hcl-tools";
const USAGE = "usage: hclfmt -check FILE... | hclfmt FILE | hclfmt -version";

async function main(args) {
  if (args[0] === "-version") {
    const manifest = require(path.join(PACKAGE, "package.json"));
    console.log(`${manifest.name} ${manifest.version}`);
    return 0;
  }
  const check = args[0] === "-check";
  const files = check ? args.slice(1) : args;
  if (files.length === 0 || (!check && files.length !== 1)) {
    console.error(USAGE);
    return 2;
  }
  const { format } = require(PACKAGE);
  let differ = 0;
  for (const file of files) {
    const text = fs.readFileSync(file, "utf8");
    const formatted = await format(text);
    if (!check) {
      process.stdout.write(formatted);
    } else if (formatted !== text) {
      console.log(file);
      differ += 1;
    }
  }
  return differ > 0 ? 3 : 0;
}

// The Go program inside the WebAssembly module never returns: exit explicitly.
main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (error) => {
    console.error(`hclfmt: ${error.message || error}`);
    process.exit(1);
  },
);
