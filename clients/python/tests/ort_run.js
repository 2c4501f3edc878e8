// Runs an ONNX model in onnxruntime (the npm package onnxruntime-node, CPU) for the Python
// tests: node ort_run.js MODULE_DIR MODEL.onnx INPUT.f32 N C H W OUTPUT.f32
// INPUT.f32 holds the float32 NCHW batch; OUTPUT.f32 receives the float32 logits.
const fs = require('fs');
const [moduleDir, model, input, n, c, h, w, output] = process.argv.slice(2);
const ort = require(moduleDir);
(async () => {
  const session = await ort.InferenceSession.create(model);
  const buf = fs.readFileSync(input);
  const data = new Float32Array(buf.buffer, buf.byteOffset, buf.length / 4);
  const x = new ort.Tensor('float32', data, [n, c, h, w].map(Number));
  const out = await session.run({input: x});
  fs.writeFileSync(output, Buffer.from(out.logits.data.buffer));
  console.log(JSON.stringify({onnxruntime: ort.env.versions.common, dims: out.logits.dims}));
})().catch((e) => { console.error(String(e)); process.exit(1); });
