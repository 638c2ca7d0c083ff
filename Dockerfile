# Keel's image for deploy/k8s/keel.yaml: `docker build -t keel:0.1.0 .` (not built on the development machine, which
# has no container runtime). The model is mounted at run time (the manifests use /models/model.gguf).
FROM node:20-bookworm-slim
WORKDIR /app
COPY package.json package-lock.json ./
# Serving needs no dev tools (TypeScript and @types/node are dependencies: the build below needs them).
RUN npm ci --omit=dev --no-audit --no-fund --loglevel=error
COPY tsconfig.json tsconfig.build.json ./
COPY bin ./bin
COPY src ./src
RUN node node_modules/typescript/bin/tsc -p tsconfig.build.json
EXPOSE 8000
ENTRYPOINT ["node", "bin/keel.mjs"]
CMD ["serve", "--rest_port", "8000"]
