// Validates Kubernetes objects against the API schemas of npm's
// kubernetes-models (and its Prometheus Operator and cert-manager models),
// offline. Reads a JSON list of objects on stdin; prints one line per
// object that fails, and exits 1 if any did (2 if a kind has no model).
"use strict";

// apiVersion group -> package whose models cover it.
const packages = {
  "": "kubernetes-models",
  "apps": "kubernetes-models",
  "policy": "kubernetes-models",
  "networking.k8s.io": "kubernetes-models",
  "monitoring.coreos.com": "@kubernetes-models/prometheus-operator",
  "cert-manager.io": "@kubernetes-models/cert-manager",
};

function modelOf(object) {
  const [group, version] = object.apiVersion.includes("/") ? object.apiVersion.split("/") : ["", object.apiVersion];
  const pkg = packages[group];
  if (pkg === undefined) return null;
  const dir = group === "" ? version : `${group}/${version}`;
  try {
    return require(`${pkg}/${dir}/${object.kind}`)[object.kind];
  } catch (e) {
    return null;
  }
}

let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  let failed = 0;
  let unknown = 0;
  const objects = JSON.parse(input);
  for (const object of objects) {
    const where = `${object.kind} ${object.metadata && object.metadata.name}`;
    const Model = modelOf(object);
    if (Model === null) {
      console.log(`${where}: no schema for ${object.apiVersion} ${object.kind}`);
      unknown++;
      continue;
    }
    try {
      new Model(object).validate();
    } catch (e) {
      console.log(`${where}: ${e.message}`);
      failed++;
    }
  }
  console.log(`${objects.length} objects validated, ${failed} invalid, ${unknown} without a schema`);
  process.exit(unknown ? 2 : failed ? 1 : 0);
});
