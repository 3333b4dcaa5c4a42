// A clawcage tool component written in JavaScript: `slugify` turns a title into a URL slug and
// `json_pick` extracts a value from a JSON document by a dotted path.
//
// Built with componentize-js against the WIT world `basic-tool` in ../../wit (see build.sh).
// The exported object `tool` implements the interface `clawcage:tool/tool`: `specs` lists the
// tools, `call` runs one. A failure the model should read is thrown as an Error whose `payload`
// is the WIT variant `tool-error` ({ tag: "invalid-args" | "denied" | "failed", val: text }).

import { log } from "clawcage:tool/log@0.1.0";

const SPECS = [
  {
    name: "slugify",
    description:
      "Turn a title into a lowercase ASCII URL slug: letters and digits kept (accents removed where the engine can), everything else collapsed into the separator.",
    inputSchema: JSON.stringify({
      type: "object",
      properties: {
        text: { type: "string", description: "The text to turn into a slug." },
        separator: {
          type: "string",
          enum: ["-", "_", "."],
          description: "What joins the words (default `-`).",
        },
      },
      required: ["text"],
      additionalProperties: false,
    }),
  },
  {
    name: "json_pick",
    description:
      "Extract the value at a dotted path (e.g. `servers.0.name`) from a JSON document given as text. Returns the value as JSON.",
    inputSchema: JSON.stringify({
      type: "object",
      properties: {
        document: { type: "string", description: "The JSON document, as text." },
        path: {
          type: "string",
          description: "Keys and array indexes separated by dots; empty for the whole document.",
        },
      },
      required: ["document", "path"],
      additionalProperties: false,
    }),
  },
];

function toolError(tag, text) {
  const error = new Error(text);
  error.payload = { tag, val: text };
  return error;
}

// Decomposes accented letters so that "é" becomes "e"; the engine may be built without Unicode
// normalisation, and then the accented letters are dropped like any other non-ASCII character.
function withoutAccents(text) {
  try {
    return text.normalize("NFKD").replace(/[\u0300-\u036f]/g, "");
  } catch {
    return text;
  }
}

function slugify({ text, separator = "-" }) {
  const words = withoutAccents(text)
    .toLowerCase()
    .split(/[^a-z0-9]+/)
    .filter((word) => word.length > 0);
  if (words.length === 0) {
    throw toolError("invalid-args", "the text has no letters or digits to make a slug from");
  }
  return words.join(separator);
}

function jsonPick({ document, path }) {
  let value;
  try {
    value = JSON.parse(document);
  } catch (error) {
    throw toolError("invalid-args", `the document is not JSON: ${error.message}`);
  }
  const steps = path === "" ? [] : path.split(".");
  const walked = [];
  for (const step of steps) {
    if (value === null || typeof value !== "object" || !Object.hasOwn(value, step)) {
      const where = walked.length === 0 ? "the document" : `\`${walked.join(".")}\``;
      throw toolError("failed", `${where} has no key or index \`${step}\``);
    }
    value = value[step];
    walked.push(step);
  }
  return JSON.stringify(value);
}

export const tool = {
  specs() {
    return SPECS;
  },

  call(name, args) {
    let parsed;
    try {
      parsed = JSON.parse(args);
    } catch (error) {
      throw toolError("invalid-args", `the arguments are not JSON: ${error.message}`);
    }
    log("debug", `running ${name}`);
    switch (name) {
      case "slugify":
        return slugify(parsed);
      case "json_pick":
        return jsonPick(parsed);
      default:
        throw toolError("invalid-args", `unknown tool \`${name}\`; this component offers slugify and json_pick`);
    }
  },
};
