"""Packaging for mlmclm. Everything it knows comes from settings.ini (nbdev's single source of truth)."""
from configparser import ConfigParser
from pathlib import Path
import setuptools

cfg = ConfigParser(delimiters=['='])
cfg.read(Path(__file__).parent/'settings.ini', encoding='utf-8')
cfg = cfg['DEFAULT']
req = lambda key: cfg.get(key, '').split()

licenses = {'apache2': 'Apache-2.0'}
statuses = ['1 - Planning', '2 - Pre-Alpha', '3 - Alpha', '4 - Beta', '5 - Production/Stable']
lic = licenses[cfg['license']]
py_versions = '3.10 3.11 3.12 3.13'.split()
min_python = cfg['min_python']

setuptools.setup(
    name=cfg['lib_name'],
    version=cfg['version'],
    description=cfg['description'],
    long_description=(Path(__file__).parent/'README.md').read_text(encoding='utf-8'),
    long_description_content_type='text/markdown',
    author=cfg['author'], author_email=cfg['author_email'],
    license=lic,
    url=cfg['git_url'],
    keywords=cfg['keywords'],
    classifiers=['Development Status :: ' + statuses[int(cfg['status'])],
                 'Intended Audience :: ' + cfg['audience'].title(),
                 'Natural Language :: ' + cfg['language'].title()]
                + ['Programming Language :: Python :: ' + v for v in py_versions[py_versions.index(min_python):]],
    # namespace discovery: asset folders without an __init__.py (the tokenizer) are packages too, so their files ship
    packages=setuptools.find_namespace_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*'], exclude=['*.__pycache__']),
    package_dir={'': '.'},   # the package sits at the root: `pip install -e .` puts the root on sys.path (a .pth file), not
                             # an import-hook finder, which setuptools announces with a warning
    include_package_data=True,
    package_data={cfg['lib_name']: ['assets/*', 'assets/**/*']},
    install_requires=req('requirements'),
    extras_require={'dev': req('dev_requirements'), 'gpu': req('gpu_requirements'), 'mteb': req('mteb_requirements')},
    python_requires='>=' + min_python,
    zip_safe=False,
    entry_points={'console_scripts': req('console_scripts'), 'nbdev': [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"]},
)
